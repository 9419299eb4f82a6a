"""For the habit of ``python setup.py ...``: every setting is in pyproject.toml, which setuptools reads.

``pip install .`` and ``pip install -r requirements.txt`` need no part of this file;
tests/packaging/test_top_level_files.py keeps it an empty ``setup()`` call.
"""
from setuptools import setup

setup()
