"""Trace replay: a discrete-event simulation of the mesh driving the real router core and mocker core."""
