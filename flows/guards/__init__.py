"""What stops a bad day: the data checks between days, the evaluate stage's numbers and the publish gate."""
