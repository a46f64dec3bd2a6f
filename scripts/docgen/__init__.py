"""The generated reference pages (hooks, CLI) and the check that the docs cover the plugin surface.

Each generated page is rendered from the code that defines what it documents
(``loader.hookspecs``, the CLI's argparse parser), so it cannot drift; the
coverage check then asks the committed docs, not the renderers, whether every
hook, public API name and CLI command and flag is there, so a page someone
forgot to regenerate fails too. ``scripts/gen_docs.py`` is the command.
"""
