"""Statistics with their intervals, pure functions below every package that reports a
number: nearest-rank percentile indices in exact arithmetic (:mod:`.ranks`, stdlib only,
the hedge window's too) and percentiles, quantile intervals, pass rates and paired
comparisons (:mod:`.intervals`), and confidence sequences valid at every look
(:mod:`.sequential`)."""
