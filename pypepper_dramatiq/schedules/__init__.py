"""Recurring schedules as stored, and the cron expressions they fire on."""
