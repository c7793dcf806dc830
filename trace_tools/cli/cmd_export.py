def export_cmd():
    """todo"""
