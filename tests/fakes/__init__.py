"""Local fakes for tests: cloud control planes on 127.0.0.1 (see control_planes.py), sealed capsules (capsule.py)."""
