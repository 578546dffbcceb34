"""Engines' server-side machinery: the in-process Grid, the ``flwr run`` launchers for the
simulation and deployment runtimes. The table of engines by name is ``flowerbed.apps.engines``
(the inline engine binds the ClientApp, which lives in the apps layer).
"""
