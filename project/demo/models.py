# The demo app has no models; its tasks are in tasks.py.
