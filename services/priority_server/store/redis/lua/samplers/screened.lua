-- samplers/screened.lua: the `screened` branch of sample.lua (its Python twin: priority_server/samplers/).
-- Sees sample.lua's locals (k, B, S: this sampler's JSON parameters, rng, take, ...).
-- screened: as heap; heap problems never tested are probes of S.probe_size completions (S.probe_unseen,
-- applied after the branch) (samplers.ScreenedSampler)
branches.screened = function() retests_then_heap(heap_top) end
