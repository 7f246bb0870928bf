"""What runs inside each training rank: instrumentation, wire client, public API.

Imported in every rank, so it stays light: no torch until the script imports
it, and never textual.
"""
