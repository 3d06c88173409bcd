"""TEST-ONLY: appends "<pid> <argv0>" to $HYBRIDSPEC_TEST_REGISTER_TRACE each time vLLM calls our register().

vLLM resolves the entry point `vllm_hybridspec.plugin:register` by attribute lookup, so wrapping the module
attribute here (imported at interpreter start via PYTHONPATH) sees every call in every process.
"""
import os
import sys

_trace = os.environ.get("HYBRIDSPEC_TEST_REGISTER_TRACE")
if _trace:
    import vllm_hybridspec.plugin as _plugin

    _original_register = _plugin.register

    def register():
        with open(_trace, "a") as f:
            f.write(f"{os.getpid()} {os.path.basename(sys.argv[0] if sys.argv else '?')}\n")
        return _original_register()

    _plugin.register = register
