"""What ep/ is given at start-up: plain data and an engine-side loader passed in (ep/spec.py), which
stays torch-free. (Which modules ep/ may import is tests/test_layering.py's rule.)"""
from __future__ import annotations

import subprocess
import sys


def test_the_spec_ep_is_given_is_plain_data_without_torch() -> None:
    """ep.spec carries the kernel configuration, a torch-free leaf of engine/kernels, and nothing
    else of the engine."""
    probe = ("import sys, pegainfer.ep.spec, pegainfer.ep.log; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton') "
             "or m.startswith('pegainfer.engine')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['pegainfer.engine', 'pegainfer.engine.kernels', 'pegainfer.engine.kernels.config']"


def test_the_engines_loader_reaches_spawned_ranks_by_name() -> None:
    """multiprocessing's spawn pickles the loader by its qualified name: it must be module-level."""
    import pickle

    from pegainfer.engine.ep_setup import ep_spec, load_rank_experts
    from pegainfer.engine.engine import EngineSpec
    spec = ep_spec(EngineSpec(random_preset="tiny", backend="host-staged", ep_size=2))
    assert spec.loader is load_rank_experts
    assert pickle.loads(pickle.dumps(spec)) == spec
