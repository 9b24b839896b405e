-- report.lua: apply a lease's outcomes (store/base.py docstring, "report").
-- KEYS[1]  stats        hash   id -> "n s1 s2 pool score"
-- KEYS[2]  heap         zset   score = priority (or its fresh_key), member = store.tie_member
-- KEYS[3]  solved       zset   score = last tested step (policy version with run.retest_versions > 0)
-- KEYS[4]  unsolved     zset   score = last tested step (policy version with run.retest_versions > 0)
-- KEYS[5]  leases       hash   lease id -> lease record
-- KEYS[6]  deadlines    zset   lease id by deadline
-- KEYS[7]  counters     hash   StoreStats counters; first_visits / first_visit_priority_sum: the first visits
--                              the prior for unseen problems is fitted to (prioreplay/unseen_prior.py)
-- KEYS[8]  tomb:reported zset  lease id -> time reported (unix s, lease clock)
-- KEYS[9]  tomb:expired zset    lease id -> time expired
-- KEYS[10] stream       stream trajectory groups (field "p" = payload)
-- KEYS[11] parts        set    members of this lease reported by earlier parts (expires a day
--                              after the lease's deadline)
-- KEYS[12] quarantine   hash   id -> the pool (1..3) a quarantined problem returns to
-- KEYS[13] tokens       hash   id -> "completions tokens" (decayed sums of reports with token ids)
-- KEYS[14] policy       hash   version, uri (the pools' clock with run.retest_versions > 0)
-- KEYS[15] owners       hash   lease id -> JSON [worker id, request id] (dropped when the lease ends)
-- KEYS[16] evidence     hash   id -> "streak_pool streak version" (rules.confirm_pool, the version of the latest report)
-- ARGV[1]  now          '' (Redis TIME: the lease clock, lib.lua clock_now), or a test's injected
--                       clock reading, unix seconds
-- ARGV[2]  lease_id
-- ARGV[3]  more_parts   '1': a part; the lease stays live for the problems not yet reported, each
--                       problem is applied at most once over all parts; '0': the last (or only) part
-- ARGV[4]  group        consumer group name of the stream
-- ARGV[5]  run          JSON of the run's settings (scripts.report_run): decay (lambda), prior_alpha,
--                       prior_beta, solved_at / unsolved_at (rules.PoolBands: 1 / 0 = all-correct /
--                       all-wrong only), retest_versions (0: a pooled problem's score is the lease's
--                       step; k >= 1: the current policy version, rules.pool_score), queue_zero_variance
--                       (true: every group with a payload is queued, plain GRPO; false: mixed ones only)
--                       age_decay (gamma: old statistics x decay x gamma^(versions since the latest report)),
--                       heap_age_decay (gamma_h < 1: a heap score is lib.lua's fresh_key of the priority at
--                       the current version, so the heap ages toward the prior's priority between reports)
-- ARGV[6]  n_outcomes
-- ARGV[7...] outcomes  2 slots per outcome, in request order (2 rather than 8 keeps the client's packing cheap):
--   ARGV[7 + 2j]  one outcome record, layouts.OUTCOME (lib.lua's OUTCOME): "member\tkind\tG\tsum r\tsum r^2\t
--                 forgetting\tbreakthrough\ttokens\tk" with kind one of
--                 mixed|all_correct|all_wrong|constant (rules.classify), sums left to right from 0.0 (as %.17g /
--                 repr strings), the two flags 0/1 (rules.is_forgetting / is_breakthrough from a pool, with the bands),
--                 tokens = the group's completion tokens (0: none sent, the token sums stay), then k =
--                 rules.evidence_groups(G, pool_evidence): pool verdicts in a row a pool needs (1: the paper)
--   ARGV[8 + 2j]  payload (bytes), queued when the group is mixed (any, with run.queue_zero_variance) and not empty
-- Outcomes for members reported by an earlier part are skipped (counted in the reply).
-- then ARGV[7 + 2 * n_outcomes] = n_unservable and one member per unservable problem after it
--   (problems to quarantine: stats pool 5 = rules.Pool.QUARANTINED, score kept, their home pool in KEYS[12]).
-- Returns {0, reason} when the lease is not live (late_reports += 1; a due lease is expired);
-- {-1, index} when outcome #index (0-based) names a problem not in the lease (nothing changed);
-- {-2, index} when unservable #index names a problem not in the lease (nothing changed);
-- {1, queued, filtered, skipped, quarantined} when applied.
local k = { stats = KEYS[1], heap = KEYS[2], solved = KEYS[3], unsolved = KEYS[4], leases = KEYS[5],
            deadlines = KEYS[6], counters = KEYS[7], tomb_reported = KEYS[8], tomb_expired = KEYS[9],
            stream = KEYS[10], parts = KEYS[11], quarantine = KEYS[12], tokens = KEYS[13], policy = KEYS[14],
            owners = KEYS[15], evidence = KEYS[16] }
local more = ARGV[3] == '1'
local sets = { k.heap, k.solved, k.unsolved }
local lease_id = ARGV[2]
local now_s, now = clock_now(ARGV[1])
refuse_when_out_of_memory(k.counters)

local record = redis.call('HGET', k.leases, lease_id)
if not record then
  redis.call('HINCRBY', k.counters, 'late_reports', 1)
  if redis.call('ZSCORE', k.tomb_reported, lease_id) then return { 0, 'already reported' } end
  if redis.call('ZSCORE', k.tomb_expired, lease_id) then return { 0, 'expired' } end
  return { 0, 'unknown lease' }
end
local f = split_tabs(record)
if tonumber(f[LEASE.deadline]) <= now then
  expire_one(k, sets, lease_id, record, now_s)
  redis.call('HINCRBY', k.counters, 'late_reports', 1)
  return { 0, 'expired' }
end

-- membership: member -> {source, score}
local leased = {}
for i = LEASE.first, #f, LEASE.stride do leased[f[i + LEASE.each_member]] = { f[i + LEASE.each_source], f[i + LEASE.each_score] } end
local n_out = tonumber(ARGV[6])
local outs, skip, skipped = {}, {}, 0
for j = 0, n_out - 1 do
  local o = split_tabs(ARGV[7 + 2 * j])
  if not leased[o[OUTCOME.member]] then
    if redis.call('SISMEMBER', k.parts, o[OUTCOME.member]) == 0 then return { -1, j } end
    skip[j] = true  -- reported by an earlier part: applied once only
    skipped = skipped + 1
  end
  outs[j] = o
end
local q_base = 7 + 2 * n_out
local n_q = tonumber(ARGV[q_base] or '0')
for j = 1, n_q do
  if not leased[ARGV[q_base + j]] then return { -2, j - 1 } end
end

local run = cjson.decode(ARGV[5])
local lam, pa, pb = run.decay, run.prior_alpha, run.prior_beta
local solved_at, unsolved_at = run.solved_at, run.unsolved_at
-- Python twin: rules.pool_score: the lease's step, or the current policy version
local version_s = redis.call('HGET', k.policy, 'version') or '0'
local version = tonumber(version_s)
local pool_score = f[LEASE.step]
if run.retest_versions > 0 then pool_score = version_s end
local gamma = run.age_decay
local gh = run.heap_age_decay or 1
local prior0 = priority(0.0, 0.0, 0.0, pa, pb)  -- rules.priority(Stats()): what the heap ages toward
local queued, filtered = 0, 0
local completions = 0
local kinds = { mixed = 0, all_correct = 0, all_wrong = 0, constant = 0 }
local forgetting, breakthroughs = 0, 0
local first_seen = 0
local fit_k, fit_sum = 0, nil  -- first visits of this report (the prior for unseen problems) and the running sum
local stream_ready = false
for j = 0, n_out - 1 do
  if not skip[j] then  -- (Lua 5.1: no continue)
  local o = outs[j]
  local member, kind, G = o[OUTCOME.member], o[OUTCOME.kind], tonumber(o[OUTCOME.group_size])
  local sr, sq = tonumber(o[OUTCOME.sum_r]), tonumber(o[OUTCOME.sum_r2])
  local source = leased[member][1]
  leased[member] = nil
  local id = member_id(member)
  local n, s1, s2 = split_stats(redis.call('HGET', k.stats, id))
  local first = tonumber(n) == 0
  if first then first_seen = first_seen + 1 end
  local streak_pool, streak, last_version = 0, 0, version
  local ev = redis.call('HGET', k.evidence, id)
  if ev then
    local a, b, c = string.match(ev, '^(%S+) (%S+) (%S+)$')
    streak_pool, streak, last_version = tonumber(a), tonumber(b), tonumber(c)
  end
  -- Python twin: rules.aged_decay: lam x gamma^(versions since the latest report), lam itself when
  -- gamma is 1 or no version passed
  local lam_s = lam
  local age = math.max(0, version - last_version)
  if gamma ~= 1 and age > 0 then lam_s = lam * gamma ^ age end
  -- Python twin: rules.update_stats (prioreplay/rules.py): n <- lam*n + G, s1 <- lam*s1 + sum r,
  -- s2 <- lam*s2 + sum r^2 (the sums come from rules.reward_sums)
  n = lam_s * tonumber(n) + G
  s1 = lam_s * tonumber(s1) + sr
  s2 = lam_s * tonumber(s2) + sq
  -- Python twin: unseen_prior.observe: a first visit of G >= 2 adds the priority its statistics give now
  if first and G >= 2 then
    fit_sum = (fit_sum or tonumber(redis.call('HGET', k.counters, 'first_visit_priority_sum') or '0')) + priority(n, s1, s2, pa, pb)
    fit_k = fit_k + 1
  end
  -- Python twin: rules.pass_rate: p = sum r / G (one IEEE division)
  local rate = sr / G
  -- Python twin: rules.destination: all-correct or p >= solved_at (< 1) -> solved, all-wrong or
  -- p <= unsolved_at (> 0) -> unsolved, else the heap
  local verdict
  if kind == 'all_correct' or (solved_at < 1 and rate >= solved_at) then verdict = 2
  elseif kind == 'all_wrong' or (unsolved_at > 0 and rate <= unsolved_at) then verdict = 3
  else verdict = 1 end
  -- Python twin: rules.confirm_pool: a pool verdict extends a run toward the same pool (or starts
  -- one of 1); the problem is pooled once the run reaches k (o[OUTCOME.evidence]), else stays in the heap
  local dest, score = verdict, nil
  if verdict == 1 then
    streak_pool, streak = 0, 0
  else
    if streak_pool == verdict then streak = streak + 1 else streak = 1 end
    streak_pool = verdict
    if streak < tonumber(o[OUTCOME.evidence] or '1') then dest = 1 end
  end
  if dest ~= 1 then score = pool_score
  else
    local prio = 0.25  -- Python twin: rules.PENDING_PRIORITY: the top of the heap, tested again at once
    if verdict == 1 then prio = priority(n, s1, s2, pa, pb) end
    -- Python twin: Store.heap_score: with heap_age_decay < 1 the key of rules.fresh_key
    if gh ~= 1 then prio = fresh_key(prio, prior0, version, gh) end
    score = fmt(prio)
  end
  redis.call('HSET', k.evidence, id, streak_pool .. ' ' .. streak .. ' ' .. version)
  redis.call('HSET', k.stats, id, fmt(n) .. ' ' .. fmt(s1) .. ' ' .. fmt(s2) .. ' ' .. dest .. ' ' .. score)
  -- Python twin: MemoryStore._apply_group: the token sums decay like the statistics
  local tok = tonumber(o[OUTCOME.tokens] or '0')
  if tok > 0 then
    local tn, tt = 0.0, 0.0
    local cur = redis.call('HGET', k.tokens, id)
    if cur then
      local a, b = string.match(cur, '^(%S+) (%S+)$')
      tn, tt = tonumber(a), tonumber(b)
    end
    redis.call('HSET', k.tokens, id, fmt(lam * tn + G) .. ' ' .. fmt(lam * tt + tok))
  end
  redis.call('ZADD', sets[dest], score, member)
  kinds[kind] = kinds[kind] + 1
  completions = completions + G
  -- Python twins: rules.is_forgetting / rules.is_breakthrough (flags computed in Python)
  if source == '2' and o[OUTCOME.forgetting] == '1' then forgetting = forgetting + 1 end
  if source == '3' and o[OUTCOME.breakthrough] == '1' then breakthroughs = breakthroughs + 1 end
  -- Python twin: contract.queues_group: mixed groups, or every group with run.queue_zero_variance
  local to_learner = kind == 'mixed' or run.queue_zero_variance
  if to_learner and ARGV[8 + 2 * j] == '' then
    -- an empty payload: a rewards-only client, nothing to queue for the learner
  elseif to_learner then
    if not stream_ready then
      if redis.call('EXISTS', k.stream) == 0 then
        redis.call('XGROUP', 'CREATE', k.stream, ARGV[4], '0', 'MKSTREAM')
      end
      stream_ready = true
    end
    redis.call('XADD', k.stream, '*', 'p', ARGV[8 + 2 * j])
    queued = queued + 1
  else
    filtered = filtered + 1
  end
  end
end
-- unservable problems: quarantined, statistics and score kept (store/base.py, "Quarantine")
for j = 1, n_q do
  local member = ARGV[q_base + j]
  local t = leased[member]
  leased[member] = nil
  local id = member_id(member)
  local n, s1, s2 = split_stats(redis.call('HGET', k.stats, id))
  redis.call('HSET', k.stats, id, n .. ' ' .. s1 .. ' ' .. s2 .. ' 5 ' .. t[2])
  redis.call('HSET', k.quarantine, id, t[1])
end
local rest = {}
if more then
  for i = LEASE.first, #f, LEASE.stride do
    if leased[f[i]] then rest[#rest + 1] = f[i] .. '\t' .. f[i + 1] .. '\t' .. f[i + 2] end
  end
  for j = 0, n_out - 1 do
    if not skip[j] then redis.call('SADD', k.parts, outs[j][OUTCOME.member]) end
  end
  redis.call('EXPIRE', k.parts, math.max(1, math.ceil(tonumber(f[LEASE.deadline]) - now)) + 86400)
else
  -- problems of the lease left out of the report return unchanged
  for member, t in pairs(leased) do place(k.stats, sets, member, t[1], t[2]) end
end

for kind, c in pairs(kinds) do
  if c > 0 then redis.call('HINCRBY', k.counters, 'groups_' .. kind, c) end
end
if completions > 0 then
  redis.call('HINCRBY', k.counters, 'completions_reported', completions)
  -- rules order: the counter adds each group's sum in request order, in doubles
  local total = tonumber(redis.call('HGET', k.counters, 'reward_sum') or '0')
  for j = 0, n_out - 1 do
    if not skip[j] then total = total + tonumber(outs[j][OUTCOME.sum_r]) end
  end
  redis.call('HSET', k.counters, 'reward_sum', fmt(total))
end
if first_seen > 0 then redis.call('HINCRBY', k.counters, 'problems_seen', first_seen) end
if fit_k > 0 then
  redis.call('HINCRBY', k.counters, 'first_visits', fit_k)
  redis.call('HSET', k.counters, 'first_visit_priority_sum', fmt(fit_sum))
end
if forgetting > 0 then redis.call('HINCRBY', k.counters, 'forgetting_events', forgetting) end
if breakthroughs > 0 then redis.call('HINCRBY', k.counters, 'breakthroughs', breakthroughs) end
if #rest > 0 then  -- a part: the lease stays live for the rest
  redis.call('HSET', k.leases, lease_id, f[LEASE.step] .. '\t' .. f[LEASE.deadline] .. '\t' .. table.concat(rest, '\t'))
  return { 1, queued, filtered, skipped, n_q }
end
redis.call('HDEL', k.leases, lease_id)
redis.call('HDEL', k.owners, lease_id)
redis.call('ZREM', k.deadlines, lease_id)
redis.call('ZADD', k.tomb_reported, now_s, lease_id)
redis.call('DEL', k.parts)
return { 1, queued, filtered, skipped, n_q }
