"""`python -m qlower`: the `qlower` command (cli.py), for environments where the console script
is not on PATH."""
from .cli import main

if __name__ == "__main__":
    main()
