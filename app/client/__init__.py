"""The client side of the `cronhook` command: verbs that talk to a running server over its
public API (CRONHOOK_URL, CRONHOOK_API_KEY), as tables for people or JSON for scripts."""
