"""tidelog.broker"""
