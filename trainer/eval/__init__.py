"""What measures a model: scoring rows with a committed model (`scoring`), several models over the same rows in
one pass (`scoring_pass`), the metrics themselves (`metrics`: AUC, log loss, calibration; `group_metrics`: per
group, GAUC), and two models' paired differences with their standard errors (`paired`)."""
