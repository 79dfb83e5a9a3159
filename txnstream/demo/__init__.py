"""The demo pipeline behind ``make demo`` / ``txnstream demo``."""
