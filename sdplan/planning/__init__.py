"""The questions the commands answer: plan, check, capacity and their intervals, k schedules, engine configs."""
