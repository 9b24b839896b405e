-- samplers/screened-pools.lua: the `screened-pools` branch of sample.lua (its Python twin: priority_server/samplers/).
-- Sees sample.lua's locals (k, B, S: this sampler's JSON parameters, rng, take, ...).
-- screened-pools: as screened, and the retests R are probes too (S.probe_retests)
-- (samplers.ScreenedPoolsSampler)
branches['screened-pools'] = function() retests_then_heap(heap_top) end
