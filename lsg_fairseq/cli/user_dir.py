"""``lsg-fairseq-user-dir``: print the path to pass to fairseq's ``--user-dir``."""

import argparse
import os


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description="Print the plugin folder to pass as `--user-dir` to fairseq-train/generate/"
        "preprocess, e.g. `fairseq-train --user-dir $(lsg-fairseq-user-dir) ...`."
    )
    parser.parse_args(argv)
    # No import of the package itself: printing a path must not pay for importing fairseq.
    print(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


if __name__ == "__main__":
    main()
