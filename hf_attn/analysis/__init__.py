"""Analysis of learned attention (library code; never shipped to the Hub)."""
