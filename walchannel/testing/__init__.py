"""Test doubles and a real local engine for harness authors (SPEC "Test doubles")."""
