"""Redaction of what is stored: personal data and secrets replaced before a call is journaled.

`rules.py` holds the built-in patterns and compiles the operator's; `placeholders.py` turns a
value into its placeholder (a keyed HMAC, per trajectory); `redactor.py` walks a JSON body;
`record.py` applies a policy's redactor to a journal record. docs/privacy.md says why.
"""
