"""What users build: jobs, workflows, tasks, their executors and their context."""
