-- samplers/knapsack.lua: the `knapsack` branch of sample.lua (its Python twin: priority_server/samplers/).
-- Sees sample.lua's locals (k, B, S: this sampler's JSON parameters, rng, take, ...).
-- Python twin: samplers.knapsack.group_signal_gain, operation for operation
local function group_signal_gain(p, g)
  local q = 1.0 - p
  return p * q * (p ^ g * q + q ^ g * p)
end

-- a binary max-heap of {key, index}: larger key first, ties the smaller index (heapq order of
-- samplers.knapsack.allocate_group_sizes: (-key, index) ascending)
local function before(a, b)
  if a[1] ~= b[1] then return a[1] > b[1] end
  return a[2] < b[2]
end
local function hpush(h, e)
  h[#h + 1] = e
  local i = #h
  while i > 1 do
    local up = math.floor(i / 2)
    if not before(h[i], h[up]) then break end
    h[i], h[up] = h[up], h[i]; i = up
  end
end
local function hpop(h)
  local top = h[1]
  h[1] = h[#h]; h[#h] = nil
  local i, n = 1, #h
  while true do
    local l, r, m = 2 * i, 2 * i + 1, i
    if l <= n and before(h[l], h[m]) then m = l end
    if r <= n and before(h[r], h[m]) then m = r end
    if m == i then break end
    h[i], h[m] = h[m], h[i]; i = m
  end
  return top
end

-- `knapsack`: R, H (top), F, then a group size per taken problem (samplers.knapsack.allocate_group_sizes)
local function sample_knapsack()
  retests_then_heap(heap_top)
  local n_t = #taken
  if n_t == 0 then return end
  local members, rates = {}, {}
  for x, t in ipairs(taken) do
    members[x] = t[1]
    local n, s1 = split_stats(redis.call('HGET', k.stats, member_id(t[1])))
    local denom = tonumber(n) + pa + pb  -- samplers.knapsack.pass_rate_estimate
    if denom <= 0.0 then rates[x] = 0.5 else rates[x] = (tonumber(s1) + pa) / denom end
  end
  local costs = member_costs(members)
  local total = 0.0
  for x = 1, n_t do total = total + costs[x] end
  local budget, spent = S.mean_group_size * total, 2 * total
  local sizes, h = {}, {}
  for x = 1, n_t do
    sizes[x] = 2
    hpush(h, { group_signal_gain(rates[x], 2) / costs[x], x })
  end
  while #h > 0 do
    local x = hpop(h)[2]
    if spent + costs[x] <= budget then
      sizes[x] = sizes[x] + 1
      spent = spent + costs[x]
      if sizes[x] < S.max_group_size then hpush(h, { group_signal_gain(rates[x], sizes[x]) / costs[x], x }) end
    end
  end
  for x = 1, n_t do taken[x][4] = sizes[x] end
end

branches.knapsack = sample_knapsack
