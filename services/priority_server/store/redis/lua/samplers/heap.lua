-- samplers/heap.lua: the `heap` branch of sample.lua (its Python twin: priority_server/samplers/).
-- Sees sample.lua's locals (k, B, S: this sampler's JSON parameters, rng, take, ...).
-- heap: R, the top of the heap, F (samplers.HeapSampler)
branches.heap = function() retests_then_heap(heap_top) end
