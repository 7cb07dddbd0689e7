"""Tests for the storage layer: one conformance suite for both stores, plus LMDB-only tests."""
