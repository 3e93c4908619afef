"""Input contracts, output schemas and expectation suites. Knows nothing about models."""
