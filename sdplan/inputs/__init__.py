"""What a question starts from: workloads, acceptance, speculation profiles, SLOs, engine limits, SD methods."""
