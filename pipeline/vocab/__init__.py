"""Events -> `vocab/<key>/date=D`: key counts per day, the trailing window's merge, admission and the cap.

`stage` runs the Dask stage; the other modules are pure steps it and the rule tests call.
"""
