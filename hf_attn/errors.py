"""The project's user-facing error class: bad input that the user can fix.

Messages are one line that names the value, the limit or valid choices, and the fix. The CLI prints them as
``hf-attn: error: <message>`` and exits with code 2.
"""


class HfAttnInputError(ValueError):
    """Bad input (file, column, language code, output directory, flag value): the message says how to fix it."""
