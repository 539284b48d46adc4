"""`rmp bench`: real rmpd processes measured against raw UDP multicast through the same socket layer."""
