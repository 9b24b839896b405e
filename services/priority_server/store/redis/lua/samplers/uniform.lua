-- samplers/uniform.lua: the `uniform` branch of sample.lua (its Python twin: priority_server/samplers/).
-- Sees sample.lua's locals (k, B, S: this sampler's JSON parameters, rng, take, ...).
-- `uniform`: idx uniform over [heap in heap order, solved, unsolved] (samplers.UniformSampler)
local function sample_uniform()
  for _ = 1, B do
    local nh = redis.call('ZCARD', k.heap)
    local ns = redis.call('ZCARD', k.solved)
    local nu = redis.call('ZCARD', k.unsolved)
    local N = nh + ns + nu
    if N == 0 then break end
    local idx = math.min(math.floor(xs_random(rng) * N), N - 1)
    local e
    if idx < nh then
      e = redis.call('ZREVRANGE', k.heap, idx, idx, 'WITHSCORES'); take(e[1], 1, e[2])
    elseif idx < nh + ns then
      e = redis.call('ZRANGE', k.solved, idx - nh, idx - nh, 'WITHSCORES'); take(e[1], 2, e[2])
    else
      e = redis.call('ZRANGE', k.unsolved, idx - nh - ns, idx - nh - ns, 'WITHSCORES'); take(e[1], 3, e[2])
    end
  end
end

branches.uniform = sample_uniform
