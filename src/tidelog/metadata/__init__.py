"""tidelog.metadata"""
