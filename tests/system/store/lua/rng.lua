-- rng.lua (test only): draws of samplers.XorShift32 in Lua, for the bit-exactness test (no keys, no writes).
-- Run after the store's lib.lua (xs_new, xs_next, xs_random, fmt), as tests/system/store/test_redis_store.py does.
-- ARGV[1]  seed32       the generator's seed (0 is mapped to 1, as in Python)
-- ARGV[2]  count        number of draws
-- Returns the draws as decimal strings of next_u32(), then the %.17g of one random().
local rng = xs_new(tonumber(ARGV[1]))
local out = {}
for i = 1, tonumber(ARGV[2]) do out[i] = string.format('%d', xs_next(rng)) end
out[#out + 1] = fmt(xs_random(rng))
return out
