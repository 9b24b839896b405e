-- publish.lua: set the policy version and weights URI (store/base.py docstring, "publish").
-- KEYS[1]  policy       hash   version, uri
-- ARGV[1]  version      integer >= 1 (validated by the caller)
-- ARGV[2]  uri          weights directory
-- Returns {0, version, uri} when set or unchanged; {1, version, uri} (the current ones) when
-- the version is lower; {2, version, uri} when it is equal with another uri.
local cur = redis.call('HMGET', KEYS[1], 'version', 'uri')
local v, uri = tonumber(cur[1] or '0'), cur[2] or ''
local new_v = tonumber(ARGV[1])
if new_v < v then return { 1, v, uri } end
if new_v == v and uri ~= ARGV[2] then return { 2, v, uri } end
redis.call('HSET', KEYS[1], 'version', ARGV[1], 'uri', ARGV[2])
return { 0, ARGV[1], ARGV[2] }
