-- samplers/posterior.lua: the `posterior` branch of sample.lua (its Python twin: priority_server/samplers/).
-- Sees sample.lua's locals (k, B, S: this sampler's JSON parameters, rng, take, ...).
-- posterior: R by the step-decayed Beta posterior (take_retests_posterior), the top of the heap, F
-- (samplers.PosteriorSampler)
branches.posterior = function() retests_then_heap(heap_top, take_retests_posterior) end
