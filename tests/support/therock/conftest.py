"""The template holds the fixture's installed ``rocm_sdk`` package, whose ``*_test.py`` run inside the venv."""

collect_ignore_glob = ["template/*"]
