"""What a value may be: text and values a store can hold, durations it bounds."""
