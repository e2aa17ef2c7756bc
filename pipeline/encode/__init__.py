"""Events + vocabulary -> `features/<key>/date=D/{train,eval}`: keys, row copies, and the same rule for serving.

`stage` runs the Dask stage; `feature_spec` applies the rule to one raw line or row at scoring time.
"""
