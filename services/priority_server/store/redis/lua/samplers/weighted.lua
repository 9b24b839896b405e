-- samplers/weighted.lua: the `weighted` branch of sample.lua (its Python twin: priority_server/samplers/).
-- Sees sample.lua's locals (k, B, S: this sampler's JSON parameters, rng, take, ...).
-- H of `weighted`: rank uniform, accepted with (priority / 0.25)^alpha, 8 tries, else the top
-- (samplers.WeightedSampler)
local function heap_weighted(want)
  for _ = 1, want do
    local size = redis.call('ZCARD', k.heap)
    if size == 0 then break end
    local chosen = nil
    for _ = 1, 8 do
      local rank = math.min(math.floor(xs_random(rng) * size), size - 1)
      local e = redis.call('ZREVRANGE', k.heap, rank, rank, 'WITHSCORES')
      local u2 = xs_random(rng)
      if u2 < (tonumber(e[2]) / 0.25) ^ S.alpha then chosen = e; break end
    end
    if chosen == nil then chosen = redis.call('ZREVRANGE', k.heap, 0, 0, 'WITHSCORES') end
    take(chosen[1], 1, chosen[2])
  end
end

branches.weighted = function() retests_then_heap(heap_weighted) end
