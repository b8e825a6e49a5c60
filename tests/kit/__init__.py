"""Test kit: helpers shared by the test suites (fault-injection proxy, throwaway PKI)."""
