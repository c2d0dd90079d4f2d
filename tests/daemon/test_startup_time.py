"""Start-up time (issue 28): /ready and the `startup_time` log line say how long the server took to get
ready and its parts (loading, capturing graphs, the warm-up requests), the graphs it captured and the
compile cache folder; the mixed-step budget reaches the GPU thread."""
from __future__ import annotations

import json
import logging

from tests.daemon.inprocess import InProcessDaemon

PARTS = ("load_s", "capture_s", "warmup_requests_s", "total_s")


def test_ready_and_the_log_report_start_up_time_by_part(tiny_model_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    with InProcessDaemon(tiny_model_dir, max_active=2, compile_cache_dir=str(tmp_path),
                         mixed_step_tokens=300) as d:
        body = d.ready()
        assert body["status"] == "ready"
        startup = body["startup"]
        assert all(isinstance(startup[k], float) and startup[k] >= 0 for k in PARTS), startup
        assert startup["total_s"] >= startup["load_s"] + startup["capture_s"] + startup["warmup_requests_s"] - 0.01
        assert startup["process_s"] >= startup["total_s"]  # the test process started before this runtime
        assert startup["graphs"] == 0 and startup["compile_cache_dir"] == str(tmp_path)  # the CPU: no graphs
        assert d.rt.gpu.batcher.mixed_step_tokens == 300
        assert d.rt.engine.cache.free_slots == 2  # the warm-up gave its slots back
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "pegainfer.engine"]
    [line] = [x for x in lines if x["event"] == "startup_time"]
    assert {k: line[k] for k in PARTS} == {k: startup[k] for k in PARTS}
    [warm] = [x for x in lines if x["event"] == "warmup_done"]
    assert warm["requests"] == 1 and warm["decode_graphs"] == warm["prefill_graphs"] == 0
