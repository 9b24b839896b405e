-- samplers/screened-posterior.lua: the `screened-posterior` branch of sample.lua (its Python twin: priority_server/samplers/).
-- Sees sample.lua's locals (k, B, S: this sampler's JSON parameters, rng, take, ...).
-- screened-posterior: screened probes + posterior retests (samplers.ScreenedPosteriorSampler)
branches['screened-posterior'] = function() retests_then_heap(heap_top, take_retests_posterior) end
