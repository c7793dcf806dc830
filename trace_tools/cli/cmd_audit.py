def audit_template_cmd():
    """todo"""
