"""tools/bench/attack (a script without a .py suffix) as a module, for the
other benchmarks that start daemons and read /proc the same way (upload,
cpushare): shared rather than copied."""

import importlib.machinery
import importlib.util
import os


def load_attack():
    path = os.path.join(os.path.dirname(os.path.realpath(__file__)), "attack")
    loader = importlib.machinery.SourceFileLoader("bench_attack", path)
    spec = importlib.util.spec_from_loader("bench_attack", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod
