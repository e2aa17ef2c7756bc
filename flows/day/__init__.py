"""One day: `run.run_day` runs the stages of `stages` in order over a `state.DayState`, writes the
`record.DayRecord`; the train stage's inputs (`day_recipe`, `parent_eval`) and the history chart."""
