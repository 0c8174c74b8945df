"""tidelog.security"""
