-- samplers/gumbel.lua: the `gumbel` branch of sample.lua (its Python twin: priority_server/samplers/).
-- Sees sample.lua's locals (k, B, S: this sampler's JSON parameters, rng, take, ...).
-- H of `gumbel`: Gumbel-top-k over the top 4*want of the heap (samplers.GumbelHeap): key of rank r
-- = log(max(priority, 1e-12)) / T - log(-log(max(u, 2^-32))), u drawn in rank order; the `want`
-- largest keys, in key order (ties: rank)
local function heap_gumbel(want)
  local top = redis.call('ZREVRANGE', k.heap, 0, 4 * want - 1, 'WITHSCORES')
  local size = #top / 2
  if size == 0 then return end
  local keys = {}
  for r = 1, size do
    local u = xs_random(rng)
    if u < 2.0 ^ -32 then u = 2.0 ^ -32 end
    local prio = tonumber(top[2 * r])
    if prio < 1e-12 then prio = 1e-12 end
    keys[r] = { math.log(prio) / S.gumbel_temperature - math.log(-math.log(u)), r }
  end
  table.sort(keys, function(a, b)
    if a[1] ~= b[1] then return a[1] > b[1] end
    return a[2] < b[2]
  end)
  for x = 1, math.min(want, size) do
    local r = keys[x][2]
    take(top[2 * r - 1], 1, top[2 * r])
  end
end

branches.gumbel = function() retests_then_heap(heap_gumbel) end
