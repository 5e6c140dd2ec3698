"""The ``kubernetes`` backend: its spec, the objects it renders and the launcher that creates them."""
