"""Background services: the scheduler that delivers due jobs and the reaper that rescues leases."""
