"""Command-line interface (typer + rich). Thin: parses, calls the modules, renders."""
