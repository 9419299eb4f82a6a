"""Install paddletrainer: ``pip install -e .`` (add ``[test]`` for the test suite)."""
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent


def read_requirements():
    lines = (HERE / "requirements.txt").read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


setup(
    name="paddletrainer",
    version="0.1.0",
    description="A PaddlePaddle-native trainer with 4D hybrid parallelism (dp, sharding, tensor, pipeline).",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["paddletrainer", "paddletrainer.*"]),
    python_requires=">=3.9",
    install_requires=read_requirements(),
    extras_require={"test": ["pytest>=7"]},
    entry_points={"console_scripts": []},
)
