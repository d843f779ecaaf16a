"""``baechi place``: placeholder until the TensorFlow importer lands."""

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--graph", required=True)


def run(args: argparse.Namespace) -> int:
    raise NotImplementedError
