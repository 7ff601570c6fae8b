"""What the server and the devices were doing during a load run."""
