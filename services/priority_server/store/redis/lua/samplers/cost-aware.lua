-- samplers/cost-aware.lua: the `cost-aware` branch of sample.lua (its Python twin: priority_server/samplers/).
-- Sees sample.lua's locals (k, B, S: this sampler's JSON parameters, rng, take, ...).
-- H of `cost-aware`: over the top 4*want of the heap, key = priority / cost, the `want` largest
-- (ties: rank), in key order (samplers.CostAwareHeap)
local function heap_cost_aware(want)
  local top = redis.call('ZREVRANGE', k.heap, 0, 4 * want - 1, 'WITHSCORES')
  local size = #top / 2
  if size == 0 then return end
  local members = {}
  for r = 1, size do members[r] = top[2 * r - 1] end
  local costs = member_costs(members)
  local keys = {}
  for r = 1, size do keys[r] = { tonumber(top[2 * r]) / costs[r], r } end
  table.sort(keys, function(a, b)
    if a[1] ~= b[1] then return a[1] > b[1] end
    return a[2] < b[2]
  end)
  for x = 1, math.min(want, size) do
    local r = keys[x][2]
    take(top[2 * r - 1], 1, top[2 * r])
  end
end

branches['cost-aware'] = function() retests_then_heap(heap_cost_aware) end
