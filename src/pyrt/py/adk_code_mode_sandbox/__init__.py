"""Sandbox runtime package (forkbox implementation of adk-code-mode protocol v2).

Served from sources embedded in the forkbox binary. Generated tool stubs import
``adk_code_mode_sandbox._rpc_client.call``.
"""

__version__ = "1.3.0"
