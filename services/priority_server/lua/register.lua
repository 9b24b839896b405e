-- register.lua: upsert one chunk of problems (store.py docstring, "register").
-- KEYS[1]  stats        hash   id -> "n s1 s2 pool score"
-- KEYS[2]  heap         zset   score = priority, member = store.tie_member
-- KEYS[3]  problems     hash   id -> JSON [prompt, answer, verifier, metadata]
-- ARGV[1]  initial      "n s1 s2 pool score" of a new problem: "0 0 0 1 <priority>"
-- ARGV[2]  priority     rules.priority(Stats()) as a %.17g string (the heap score)
-- ARGV[3]  chunk        one line per problem, "id\tmember\tJSON" joined by "\n" (ids hold no
--                       control characters and compact JSON escapes them, so the split is
--                       exact; one argument keeps the client's packing cheap). Ids are unique.
-- Returns {created, updated}.
local created, updated = 0, 0
for id, member, record in string.gmatch(ARGV[3], '([^\t\n]+)\t([^\t\n]+)\t([^\n]+)') do
  redis.call('HSET', KEYS[3], id, record)
  if redis.call('HSETNX', KEYS[1], id, ARGV[1]) == 1 then
    redis.call('ZADD', KEYS[2], ARGV[2], member)
    created = created + 1
  else
    updated = updated + 1
  end
end
return { created, updated }
